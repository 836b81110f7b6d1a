"""The columnar decision engine: one kernel for the backtest, the backfill and (next) the
stream. Pure: numpy and pyarrow only, no Spark, no Redis."""
