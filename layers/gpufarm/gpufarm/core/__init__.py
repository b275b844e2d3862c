"""The pure core: models, lifecycle rules and policies. No HTTP, boto3 or NVML here."""
