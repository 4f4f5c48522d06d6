"""Pip install of the pure-Python core of timebill_ros.

The ROS 2 build (interfaces, launch files, ``ros2 run``) goes through CMakeLists.txt and colcon;
this file only serves ``pip install .`` of the core, which never imports rclpy.
"""

from setuptools import find_packages, setup

setup(
    name='timebill_ros',
    version='0.1.0',
    description='Time-budgeted LLM inference (TimeBill) as a ROS 2 action server',
    license='Apache-2.0',
    maintainer='timebill_ros maintainers',
    maintainer_email='maintainers@timebill-ros.dev',
    packages=find_packages(include=['timebill_ros', 'timebill_ros.*'],
                           exclude=['test', 'test.*']),
    # the C++ kernels are compiled on the machine that runs them (engine/kernels)
    package_data={'timebill_ros.engine.kernels': ['*.cpp', '*.h']},
    python_requires='>=3.10',
    # Loose bounds; requirements.txt holds the tested pins. Install torch first from the
    # CPU index, or pip may pull the CUDA build.
    install_requires=[
        'numpy>=1.24',
        'scipy>=1.10',
        'PyYAML>=6.0',
        'torch>=2.1',
        'transformers>=4.48',
        'gguf>=0.10',
        'accelerate>=1.0',
        'kvpress>=0.5',
        'onnxruntime>=1.17',
        'ninja>=1.11',
    ],
    extras_require={'test': ['pytest', 'flake8', 'flake8-docstrings']},
    entry_points={'console_scripts': ['timebill = timebill_ros.cli:main']},
)
