"""Status, phase and policy codes shared by the core and the ROS adapter.

They mirror the constants of ``action/Instruct.action``; a test checks that the generated
interface agrees. The core uses these so it never imports message types.
"""

# Result status codes.
COMPLETED = 1
KILLED = 2
SKIPPED = 3
REJECTED = 4
CANCELED = 5
FAILED = 6

STATUS_NAMES = {
    COMPLETED: 'COMPLETED', KILLED: 'KILLED', SKIPPED: 'SKIPPED',
    REJECTED: 'REJECTED', CANCELED: 'CANCELED', FAILED: 'FAILED',
}

# Feedback phases.
PHASE_QUEUED = 0
PHASE_PREFILL = 1
PHASE_DECODE = 2

# Overrun policies as sent in a goal.
POLICY_DEFAULT = 0
POLICY_KILL = 1
POLICY_SKIP_NEXT = 2
POLICY_PARTIAL = 3

POLICY_CODES = {'kill': POLICY_KILL, 'skip_next': POLICY_SKIP_NEXT, 'partial': POLICY_PARTIAL}
POLICY_BY_CODE = {code: name for name, code in POLICY_CODES.items()}

# Why a goal's answer ended (result and GoalEvent ``finish_reason``): one word per way.
FINISH_EOS = 'eos'                # the model ended its answer
FINISH_LENGTH = 'length'          # max_new_tokens (or the model's context) reached
FINISH_STOP = 'stop'              # a stop string appeared (the response ends before it)
FINISH_REPETITION = 'repetition'  # the loop guard: the answer repeated a cycle (cut there)
FINISH_DEADLINE = 'deadline'      # its deadline stopped it (Kill, Partial, or expired queued)
FINISH_CANCELED = 'canceled'      # its client canceled it
FINISH_REJECTED = 'rejected'      # refused before running (bad input, queue full, infeasible)
FINISH_SKIPPED = 'skipped'        # skip-next: came due while another goal overran
FINISH_SHUTDOWN = 'shutdown'      # the server shut down
FINISH_ERROR = 'error'            # an internal error ended it
FINISH_REASONS = (FINISH_EOS, FINISH_LENGTH, FINISH_STOP, FINISH_REPETITION, FINISH_DEADLINE,
                  FINISH_CANCELED, FINISH_REJECTED, FINISH_SKIPPED, FINISH_SHUTDOWN,
                  FINISH_ERROR)
# The finish reason a status implies when nothing more precise was recorded.
FINISH_OF_STATUS = {KILLED: FINISH_DEADLINE, SKIPPED: FINISH_SKIPPED,
                    REJECTED: FINISH_REJECTED, CANCELED: FINISH_CANCELED, FAILED: FINISH_ERROR}

# How each status ends the action: 'succeed', 'abort' or 'canceled'.
ACTION_OUTCOME = {
    COMPLETED: 'succeed', KILLED: 'abort', SKIPPED: 'abort',
    REJECTED: 'abort', CANCELED: 'canceled', FAILED: 'abort',
}
