"""Connectors that put stream-svm models on message streams (Kafka) and export their metrics."""
