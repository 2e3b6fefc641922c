"""NSQ (nsqd TCP protocol V2) wire codec, IDENTIFY negotiation and stream compression; sans-IO."""
