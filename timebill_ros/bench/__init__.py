"""Offline benchmarks through the real node; never imported by the robot side.

TimeBill (``timebill``), engine speed (``engine``, ``llama_cpp``) and RT-LM scheduling
(``scheduling``); what they share: an Instruct result as a row (``rows``) and the benchmark
servers, each ``timebill serve`` as its own process (``server_process``).
"""
