"""`gpuwatch report`: chargeback figures (GPU-hours, cost, waste, cost per unit) over a period.

`aggregate` sums the records (pure), `pricing` prices the GPU time no pod was allocated,
`read` feeds the aggregation from Kafka, `render` prints it, `plot` draws it.
"""
