#!/usr/bin/env bash
# The peers of benchmarks/peers.py that cannot share numaserve's environment, each in a venv of
# its own under .peers/ (infinity-emb pins click<8.2, which constraints.txt does not allow).
# torch is pinned to the CPU build, as in constraints.txt; ONNX Runtime, tokenizers and numpy
# to numaserve's versions where the peer lets us choose. TorchServe also needs a JDK:
# apt-get install openjdk-17-jre-headless.
# Run:  benchmarks/peer_apps/install.sh    (about 12 minutes, 6 GB)
set -euo pipefail
cd "$(dirname "$0")/../.."
pins() { grep -i -E "^($1)==" constraints.txt; }

python3 -m venv .peers/infinity
.peers/infinity/bin/pip install -q 'infinity-emb[server,optimum]==0.0.78' 'torch==2.13.0'

python3 -m venv .peers/torchserve
.peers/torchserve/bin/pip install -q 'torchserve==0.12.0' 'torch-model-archiver==0.12.0' \
    'torch==2.13.0' $(pins 'onnxruntime|tokenizers|numpy')
command -v java >/dev/null || echo "TorchServe needs Java: apt-get install openjdk-17-jre-headless"

# sentence-transformers' ONNX backend (optimum-onnx, which needs transformers < 4.58, and so a
# tokenizers older than numaserve's), for benchmarks/embedders.py --st-onnx.
python3 -m venv .peers/st-onnx
.peers/st-onnx/bin/pip install -q 'sentence-transformers==5.7.0' 'transformers==4.57.6' \
    'optimum-onnx[onnxruntime]==0.1.0' 'torch==2.13.0' $(pins 'onnxruntime|numpy')

# sentence-transformers' OpenVINO backend (optimum-intel, which needs transformers < 5.6, and
# exports Gemma3 only under transformers 5.0), for benchmarks/embedders.py --st-openvino. Its
# static int8 calibrates through `datasets`; torchvision (which optimum-intel asks for) is
# removed: its wheel does not load beside torch's CPU build, and transformers imports it.
python3 -m venv .peers/st-openvino
.peers/st-openvino/bin/pip install -q 'sentence-transformers==6.2.0' 'transformers==5.0.0' \
    'optimum-intel==2.2.0' 'huggingface-hub==1.21.0' 'datasets==5.0.1' 'torch==2.13.0' \
    $(pins 'openvino|numpy')
.peers/st-openvino/bin/pip uninstall -y -q torchvision

# PyLate (which pins sentence-transformers 4), for benchmarks/colbert.py: its own ColBERT's
# encode, run by benchmarks/peer_apps/pylate_encode.py.
python3 -m venv .peers/pylate
.peers/pylate/bin/pip install -q 'pylate==1.2.0' 'torch==2.13.0' $(pins 'numpy')
