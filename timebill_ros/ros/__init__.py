"""The rclpy adapter: the only part of timebill_ros that imports ROS."""
