"""Run metrics -> PNG figures + one HTML page (`nestor report RUN_DIR`)."""
