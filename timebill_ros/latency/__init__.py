"""Latency profiling: measurement harness, few-shot probes and latency predictors (SimFLi).

Never imports rclpy.
"""
