"""hf_mlcl.losses"""
