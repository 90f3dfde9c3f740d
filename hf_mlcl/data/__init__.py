"""hf_mlcl.data"""
