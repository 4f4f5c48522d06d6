"""``timebill schedbench``: scheduling policies under Poisson load, through the real node.

After RT-LM Sec. V, adapted to one CPU and to deadlines:

- Workload subsets (``workload``): held-out prompts of the length predictor's corpus (test
  split; val joins when test is too small) with the target model's measured response length N
  (``data/rlp/lengths.jsonl``; greedy, capped at n_model = 128), in three subsets of small,
  medium ("normal") and large variance of N (RT-LM Table III): ``small`` = the goals whose N
  lies closest to the pool's median, ``medium`` = one goal from each of ``goals`` equal rank
  strata of the pool (the pool's own distribution), ``large`` = the shortest half and the
  longest half. Prompts longer than ``--max-prompt-tokens`` are left out of the pool, so that
  the subsets' service times vary through N rather than through a few very long prefills.
- Capacity of each subset (``capacity``): a sample of its goals (evenly spread over their
  predicted service times) runs one at a time on an idle server; capacity = 1 / mean service
  time, where the subset's mean comes from the time model over all its goals, fitted to the
  sample's measured times (scale x t^_e2e + overhead): a small sample's own mean would hang on
  which goals it drew.
- Arrivals: Poisson at ``load x capacity`` goals/s. Each goal's deadline is a time budget
  t^_e2e x s with t^_e2e = prefill(N_x) + N decoding steps from the calibration taken at the
  start, and s uniform in ``--slack``; overrun policy Kill (``--overrun skip_next``: a
  running goal finishes late, queued goals that come due meanwhile are SKIPPED), N_max = 128.
  With ``--budget-basis service`` the factor multiplies the goal's service time through the server
  instead (the capacity sample's fit scale x t^_e2e + overhead: the time model leaves out
  what a goal costs beyond prefill and decoding, which short goals feel most). For one subset and
  repeat, every load uses the same goal order, slack factors and unit exponential gaps, the
  gaps divided by the rate (common random numbers: the loads differ only in load).
- Methods (``methods``): one server process per method (``METHODS``), all started at once and
  sharing the calibration; each (subset, load, repeat) trace is played against every method in
  turn (``run``), the order rotated from cell to cell, so drift of the machine's speed hits all
  alike. Goals are sent at their arrival times without waiting; results are collected after the
  trace, and every result is in before the next method starts.
- ``metrics`` turns the goal rows into each cell's figures, ``report`` writes the markdown
  tables, the plot and the calibration report.
"""
