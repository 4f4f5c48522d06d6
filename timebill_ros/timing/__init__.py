"""The time model: Eq. 4 calibration, the TimeBill budget math (Eq. 5-11), online correction."""
