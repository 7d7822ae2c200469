"""The CLI's own stored conversations on this executor: their index in the store, and threads made from them."""
