"""Offline benchmarks through the real node; never imported by the robot side.

TimeBill (``timebill``), engine speed (``engine``, ``llama_cpp``) and RT-LM scheduling
(``schedbench``).
"""
