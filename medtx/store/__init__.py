"""The warehouse on disk: connections and migrations (`db`), the one-writer lock (`writer_lock`), who owns a
running run (`run_owners`), content fingerprints for caching (`fingerprint`) and dataset names (`datasets`)."""
