"""`spcli eval`: quality of token selectors against full prefill (tasks, selectors, metrics, report)."""
