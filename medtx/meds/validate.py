class MedsFormatError(ValueError): pass
