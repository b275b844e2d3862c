"""`gpufarm demo`: the whole lifecycle on a local sandbox, every step checked."""
