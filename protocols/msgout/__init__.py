"""msgout over HTTP/JSON: queues, fetch and ack by receipt, long polls, push to a URL."""
