"""Tables as sources: Iceberg, Delta Lake, Lance, Hugging Face datasets, at a snapshot, and rows appended since."""
