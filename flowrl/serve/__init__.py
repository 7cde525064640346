"""Policies outside training: Ray-free inference from a checkpoint's portable files (``load_policy``) and
export to TorchScript or ONNX."""
