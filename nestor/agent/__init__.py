"""One episode: tool schemas, the tool loop, the outer reward."""
