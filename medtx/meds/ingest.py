class MedsIngestResult: pass
def ingest_meds(): pass
