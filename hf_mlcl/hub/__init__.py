"""hf_mlcl.hub"""
