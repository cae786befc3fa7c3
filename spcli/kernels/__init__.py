"""Hot parts of the data path: each file holds a pure-torch reference, a Triton kernel and a dispatcher."""
