

import hlo_trace  # noqa: F401, E402 - first: Ctrl-C while the command imports is one line (quiet_interrupts)
