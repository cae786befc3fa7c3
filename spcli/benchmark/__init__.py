"""`spcli bench`: TTFT, throughput and max QPS of full prefill vs spcli; the random 8B/405B-ratio pair."""
