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

# How each status ends the action: 'succeed', 'abort' or 'canceled'.
ACTION_OUTCOME = {
    COMPLETED: 'succeed', KILLED: 'abort', SKIPPED: 'abort',
    REJECTED: 'abort', CANCELED: 'canceled', FAILED: 'abort',
}
