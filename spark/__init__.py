"""Batch jobs over mqserver's data files. They import only L{mqserver.store.format}."""
