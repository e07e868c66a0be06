"""Small real checkpoints saved with save_pretrained, for tests (no model hub here)."""

from __future__ import annotations

from pathlib import Path

LABELS = ("negative", "neutral", "positive")
NER_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "MISC")  # MISC: no B-/I- prefix


def save_tiny_classifier(path: Path, problem_type: str | None = None) -> Path:
    """A 2-layer BertForSequenceClassification, random weights with a fixed seed, and the
    bundled MiniLM tokenizer (bert-base-uncased's vocabulary): loads and runs in moments.
    `problem_type`: transformers' ("multi_label_classification" scores labels one by one)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from numaserve.checkpoint.paths import resolve_model_path

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
        problem_type=problem_type,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    return path


def save_tiny_embedder(
    path: Path,
    pooling_mode,
    normalize: bool = True,
    dense: tuple[tuple[int, str, bool], ...] = (),
    prompts: dict | None = None,
    default_prompt_name: str | None = None,
    config=None,
):
    """A 2-layer, 64-wide model (random weights, fixed seed; a BertModel unless `config`, a
    transformers config of that width, says otherwise) saved as a sentence-transformers model
    with this pooling, with or without a Normalize module, optionally Dense layers after the
    pooling (each `(out_features, torch.nn activation's name, bias)`), and optionally prompts
    of its own (as E5, BGE and EmbeddingGemma have)."""
    import warnings

    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig

    with warnings.catch_warnings():  # v5 moved `models`; the old path works on v3 to v6
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import SentenceTransformer, models

    from numaserve.checkpoint.paths import resolve_model_path

    torch.manual_seed(0)
    if config is None:
        config = BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
        )
    AutoModel.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    modules = [models.Transformer(str(path)), models.Pooling(64, pooling_mode=pooling_mode)]
    width = 64 * (1 if isinstance(pooling_mode, str) else 2)
    for out, activation, bias in dense:
        act = getattr(torch.nn, activation)()
        modules.append(models.Dense(width, out, bias=bias, activation_function=act))
        width = out
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name
    )
    model.save(str(path))
    return path


def _small(config_class, **extra):
    """A 2-layer, 64-wide config of `config_class` over bert-base-uncased's vocabulary."""
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2)
    return lambda: config_class(**sizes, intermediate_size=128, vocab_size=30522, **extra)


def embedders() -> dict:
    """The embedding architectures users pick now, each as a small config (64 wide, 2 layers,
    MiniLM's vocabulary and special tokens) with the pooling its published checkpoints use:
    NomicBERT (nomic-embed-text), GTE (gte-v1.5, gte-multilingual), jina-embeddings-v3,
    EuroBERT, Qwen3 (Qwen3-Embedding: the last token) and Gemma3 (EmbeddingGemma:
    bidirectional, a sliding window short enough that the test texts pass it, and a layer of
    each attention type)."""
    import transformers as t

    sizes = dict(
        vocab_size=30522,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
    )
    grouped = dict(num_key_value_heads=1, head_dim=32)
    return {
        "nomic_bert": (lambda: t.NomicBertConfig(**sizes), "mean"),
        "gte": (lambda: t.GteConfig(**sizes), "cls"),
        "jina_embeddings_v3": (lambda: t.JinaEmbeddingsV3Config(**sizes), "mean"),
        "eurobert": (lambda: t.EuroBertConfig(**sizes, num_key_value_heads=1), "mean"),
        "qwen3": (lambda: t.Qwen3Config(**sizes, **grouped), "lasttoken"),
        "gemma3_text": (
            lambda: t.Gemma3TextConfig(
                **sizes,
                **grouped,
                use_bidirectional_attention=True,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
            ),
            "mean",
        ),
    }


def architectures() -> dict:
    """The encoder architectures numaserve serves, each as a small config that keeps the
    architecture's quirks (RoBERTa's position offset, ALBERT's factorised embeddings)."""
    import transformers as t

    roberta_like = dict(max_position_embeddings=514, pad_token_id=1)
    return {
        "bert": _small(t.BertConfig),
        "distilbert": lambda: t.DistilBertConfig(
            dim=64, n_layers=2, n_heads=2, hidden_dim=128, vocab_size=30522
        ),
        "roberta": _small(t.RobertaConfig, **roberta_like),
        "xlm-roberta": _small(t.XLMRobertaConfig, **roberta_like),
        "camembert": _small(t.CamembertConfig, **roberta_like),
        "electra": _small(t.ElectraConfig, embedding_size=64),
        "mpnet": _small(t.MPNetConfig, **roberta_like),
        "albert": _small(t.AlbertConfig, embedding_size=32),
        "deberta-v2": _small(t.DebertaV2Config),
        # Its special-token ids default to its own tokenizer's; these are the MiniLM one's.
        "modernbert": _small(
            t.ModernBertConfig,
            pad_token_id=0,
            bos_token_id=101,
            cls_token_id=101,
            eos_token_id=102,
            sep_token_id=102,
        ),
    }


def save_tiny_model(path: Path, architecture: str, task: str = "embed") -> Path:
    """A small random model of `architecture` (architectures()) for `task`, with the bundled
    MiniLM tokenizer. Heads get weights 5x the usual spread, so that their outputs differ
    from input to input by more than the tolerances the tests check (a pair's token types,
    say, move a score by 1e-5 at the usual spread)."""
    import torch
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    from numaserve.checkpoint.paths import resolve_model_path

    torch.manual_seed(0)
    config = architectures()[architecture]()
    if task == "classify":
        config.num_labels, config.id2label = len(LABELS), dict(enumerate(LABELS))
        config.label2id = {label: i for i, label in enumerate(LABELS)}
    if task == "rerank":  # a cross-encoder: one score
        config.num_labels = 1
    if task == "ner":
        config.num_labels, config.id2label = len(NER_LABELS), dict(enumerate(NER_LABELS))
        config.label2id = {label: i for i, label in enumerate(NER_LABELS)}
    if task != "embed":
        config.initializer_range = 0.1
    loader = {
        "embed": AutoModel,
        "ner": AutoModelForTokenClassification,
    }.get(task, AutoModelForSequenceClassification)
    loader.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    return path


def save_tiny_cross_encoder(path: Path, architecture: str = "bert", activation=None) -> Path:
    """save_tiny_model for rerank, saved again by sentence-transformers' CrossEncoder, which
    records its activation (Sigmoid unless `activation`, a torch module, says otherwise)."""
    import warnings

    save_tiny_model(path, architecture, "rerank")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import CrossEncoder

        extra = {} if activation is None else {"activation_fn": activation}
        CrossEncoder(str(path), device="cpu", **extra).save(str(path))
    return path


def save_byte_level_bpe_tokenizer(path: Path) -> Path:
    """A RoBERTa-style byte-level BPE tokenizer, trained here on stdlib sentences (400 tokens,
    RoBERTa's special tokens and ids), over whatever tokenizer `path` had. It does not mark
    word continuations as WordPiece's "##" does."""
    import warnings

    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    from numaserve.corpus import stdlib_sentences

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator(stdlib_sentences(500), vocab_size=400, special_tokens=specials)
    raw = bpe._tokenizer
    raw.post_processor = processors.RobertaProcessing(
        ("</s>", raw.token_to_id("</s>")), ("<s>", raw.token_to_id("<s>")), trim_offsets=True
    )
    for stale in (
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        (path / stale).unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token")
        PreTrainedTokenizerFast(
            tokenizer_object=raw, **dict(zip(names, specials, strict=True))
        ).save_pretrained(path)
    return path


def save_tiny_splade(
    path: Path, strategy: str = "max", activation: str = "relu", v6_modules: bool = False
) -> Path:
    """A 2-layer BertForMaskedLM (random weights, fixed seed) over bert-base-uncased's
    vocabulary, saved as sentence-transformers' SparseEncoder saves a SPLADE model
    (MLMTransformer, or with `v6_modules` a fill-mask Transformer, then SpladePooling with
    this strategy and activation)."""
    import warnings

    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from numaserve.checkpoint.paths import resolve_model_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SparseEncoder
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    BertForMaskedLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    pooling = SpladePooling(pooling_strategy=strategy, activation_function=activation)
    if v6_modules:
        from sentence_transformers.sentence_transformer.modules import Transformer

        mlm = Transformer(str(path), transformer_task="fill-mask")
    else:
        mlm = MLMTransformer(str(path))
    SparseEncoder(modules=[mlm, pooling], device="cpu").save(str(path))
    return path


def sparse_encoder_weights(path: Path, texts: list[str]):
    """sentence-transformers' SparseEncoder on `texts`: each text's whole vector (numpy)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SparseEncoder

        encoder = SparseEncoder(str(path), device="cpu")
        return encoder.encode(texts, convert_to_tensor=True).to_dense().numpy()


def save_tiny_colbert(
    path: Path,
    expansion: dict | None = None,
    skiplist: bool = True,
    query_length: int | None = 32,
    document_length: int | None = 180,
    dense: int | None = 48,
    prompts: dict | None = None,
) -> Path:
    """A 2-layer, 64-wide BertModel (random weights, fixed seed) saved as sentence-transformers
    6's MultiVectorEncoder saves a ColBERT model: the Transformer with its query and document
    lengths and query expansion (ColBERT's by default: fixed at 32, not attended), a Dense
    projection without bias, Normalize on token vectors, and a MultiVectorMask with the
    punctuation skiplist; prompts "[Q] " and "[D] " unless `prompts` says otherwise."""
    import string
    import warnings

    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from numaserve.checkpoint.paths import resolve_model_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import MultiVectorEncoder
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    AutoModel.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    if expansion is None:
        expansion = {"strategy": "fixed", "length": 32}
    transformer = Transformer(
        str(path),
        query_length=query_length,
        document_length=document_length,
        query_expansion=expansion or None,
    )
    modules = [transformer]
    if dense:
        modules.append(
            Dense(
                64,
                dense,
                bias=False,
                activation_function=torch.nn.Identity(),
                module_input_name="token_embeddings",
                module_output_name="token_embeddings",
            )
        )
    modules.append(Normalize(module_input_name="token_embeddings"))
    modules.append(MultiVectorMask(list(string.punctuation) if skiplist else None))
    if prompts is None:
        prompts = {"query": "[Q] ", "document": "[D] "}
    MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu").save(str(path))
    return path


def multi_vector_encoder(path: Path):
    """sentence-transformers' own MultiVectorEncoder of a checkpoint, on the CPU."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import MultiVectorEncoder

        return MultiVectorEncoder(str(path), device="cpu")


def save_tiny_pylate_v3(
    path: Path,
    query_prefix: str = "[unused0]",
    document_prefix="[unused1]",
    model_type: str | None = "ColBERT",
):
    """A 2-layer, 64-wide BertModel (random weights, fixed seed) in the shape of PyLate's
    ColBERT saves (answerai-colbert-small-v1's, for one): only a Transformer and a PyLate
    Dense in modules.json, and the late-interaction settings at the top of
    config_sentence_transformers.json (the prefixes, query and document lengths,
    `attend_to_expansion_tokens`, the punctuation skiplist; `model_type: ColBERT` in older
    saves, none in PyLate 1.2's, the file checked against a real one). A prefix the vocabulary
    lacks ("[Q] ") is added to the tokenizer, as PyLate adds it."""
    import json
    import string

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from numaserve.checkpoint.paths import resolve_model_path

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    model = AutoModel.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm"))
    new = [p for p in (query_prefix, document_prefix) if p not in tokenizer.get_vocab()]
    if new:
        tokenizer.add_tokens(new)
        model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "sentence_bert_config.json").write_text(
        '{"max_seq_length": 179, "do_lower_case": false}'
    )
    dense = path / "1_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(
        '{"in_features": 64, "out_features": 48, "bias": false, '
        '"activation_function": "torch.nn.modules.linear.Identity"}'
    )
    save_file({"linear.weight": torch.randn(48, 64) / 8}, str(dense / "model.safetensors"))
    top = {
        **({"model_type": model_type} if model_type else {}),
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": query_prefix,
        "document_prefix": document_prefix,
        "query_length": 32,
        "document_length": 180,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
    }
    (path / "config_sentence_transformers.json").write_text(json.dumps(top))
    return path
