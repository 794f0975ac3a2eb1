"""How portable mode routes each operation: the dispatch mode, the routing rules, the op table."""
