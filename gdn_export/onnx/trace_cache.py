"""placeholder"""
def cache_key(model, kinds, opset): return None
def load(key): return None
def store(key, template): pass
def describe(key): return ""
