"""What reads a checkpoint, at the ground of the package: the base (config, tasks) and every
process read the model through it, and it reads nothing of numaserve's.

- `paths.py`: where `model.path` points (a local directory, a `bundled:` model, or a hub id
  found in the local Hugging Face cache; numaserve never downloads), and a path read against
  a config file's directory;
- `files.py`: the checkpoint's own JSON files, and the longest input it takes;
- `errors.py`: `ModelLoadError` (the model cannot be loaded; retrying will not help) and
  `MissingRuntime` (the backend's runtime is not installed here).
"""
