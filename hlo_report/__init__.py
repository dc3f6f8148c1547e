"""The report pages (hlo-report): JSON and CSV outputs of the commands -> one self-contained HTML file."""
