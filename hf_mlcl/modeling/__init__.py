"""hf_mlcl.modeling"""
