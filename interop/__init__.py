"""Data in from elsewhere and out to other tools: Minari datasets and logs in CSV or Parquet become our datasets
(`orl datasets import`), and ours become Minari datasets (`orl datasets export`)."""
