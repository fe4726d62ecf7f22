"""What the asynchronous-FL tests share: the 3-client device table of the clock's by-hand example."""

THREE = {
    "speed": {"dist": "table", "table": [1 / 64, 1 / 32, 1 / 16]},  # s per sample
    "download_bw": {"dist": "table", "table": [2**20, 2**21, 2**19]},  # bytes/s
    "upload_bw": {"dist": "table", "table": [2**19, 2**20, 2**18]},
    "download_latency_s": {"dist": "table", "table": [0.125, 0.25, 0.0625]},
    "upload_latency_s": {"dist": "table", "table": [0.125, 0.125, 0.25]},
}
