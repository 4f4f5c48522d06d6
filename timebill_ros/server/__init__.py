"""The server core: admission, queue and scheduling, executors, jobs, results, statistics.

Never imports rclpy; ``timebill_ros.ros`` adapts it to ROS 2.
"""
