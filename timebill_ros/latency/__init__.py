"""The SimFLi latency study (offline): measurement grid, latency predictors, evaluation, WCET.

The few-shot calibration the server runs at start-up lives in ``timebill_ros.timing``; this
package compares it with SimFLi's predictors. Never imported by the robot side.
"""
