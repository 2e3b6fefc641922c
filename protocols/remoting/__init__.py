"""Pure (sans-IO) codec for the RocketMQ 4.x remoting protocol: frames, headers, properties."""
