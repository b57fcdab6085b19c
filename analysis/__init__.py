"""Analysis of the pipeline's Parquet outputs: fits, drift, tables, figures, report. No model code."""
