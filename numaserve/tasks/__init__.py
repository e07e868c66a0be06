"""The tasks numaserve serves, one module each (`embed.py`, `classify.py`, `rerank.py`,
`ner.py`, `sparse.py`, `multivector.py`): what its requests carry, what its model's head computes, what its
worker sends, what its router adds and what its client returns.

A new task is a module here (a `Task`, base.py) and its line in TASKS. Beside them:
`requests.py` checks a client's request completely (the keys every request has; a task's own
by its task); `pooling.py` and `prompts.py` read and apply a sentence-transformers model's
pooling and prompts; `entities.py` groups a token classifier's tokens (`tokens.py`: what the
tokenizer says of each); `sides.py` reads how a late-interaction checkpoint reads queries and
documents; `late_chunking.py` pools a text's chunks from one pass over it; `agreement.py` holds the accuracy gate's bars for each kind of answer.
May import: checkpoint/ and wire/.
"""

from __future__ import annotations

from numaserve.tasks.base import Task
from numaserve.tasks.classify import CLASSIFY
from numaserve.tasks.embed import EMBED
from numaserve.tasks.multivector import MULTIVECTOR
from numaserve.tasks.ner import NER
from numaserve.tasks.rerank import RERANK
from numaserve.tasks.sparse import SPARSE

TASKS: dict[str, Task] = {
    task.name: task for task in (EMBED, CLASSIFY, RERANK, NER, SPARSE, MULTIVECTOR)
}
NAMES = tuple(TASKS)


def serves(task: str, op: str) -> bool:
    """Whether a model of `task` answers requests of `op` (its own, or one it serves also)."""
    return op == task or op in TASKS[task].serves_also
