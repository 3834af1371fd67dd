"""The Faust adapter: the worker's app, tables, record batches, consumer, inboxes, tick timer."""
