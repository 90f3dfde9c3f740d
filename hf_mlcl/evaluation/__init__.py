"""hf_mlcl.evaluation"""
