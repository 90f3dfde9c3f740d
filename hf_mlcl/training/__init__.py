"""hf_mlcl.training"""
