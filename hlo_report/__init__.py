"""The report pages (hlo-report): JSON and CSV outputs of the commands -> one self-contained HTML file."""

import hlo_trace  # noqa: F401, E402 - first: Ctrl-C while the command imports is one line (quiet_interrupts)
