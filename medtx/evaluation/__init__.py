"""What a test figure means: patient-bootstrap intervals for a run's metrics (`uncertainty`) and the paired
comparisons against the reference baseline (`comparisons`). The metric functions themselves are medtx.metrics."""
