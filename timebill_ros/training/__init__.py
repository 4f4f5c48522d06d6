"""Length-predictor training (offline): corpus, length collection, RLP and baselines, export.

What the server reads of an exported file is ``timebill_ros.predictors.contract``; the robot
side never imports this package.
"""
