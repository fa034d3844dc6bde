class CodeMapping: pass
def load_mapping(): pass
