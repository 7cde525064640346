"""What a run reports: loggers (TensorBoard, CSV, W&B, MLflow), the progress display and plots."""
