-- The seed's backfill: 12 Nexmark splits, split 0 six times faster than the
-- others, feeding a keyed HOP window on RocksDB. The alignment group keeps
-- every reader within 30 s of event time of the slowest one, so the window
-- state stays bounded by the drift instead of growing with the skew.
-- This synthetic backfill covers ~40 s of event time per second per
-- reader (split 0 ~240 s), and split 0 is done in under a second if nothing
-- holds it back: the update interval must be short for alignment to act in
-- time. Since Flink 2.3 a split is paused when the OLDEST of its last
-- `pipeline.watermark-alignment.buffer-size` (default 3) sampled watermarks
-- is past the group minimum + drift (FLINK-37399), so it runs about three
-- update intervals beyond the bound before it pauses. At 100 ms that is
-- ~0.3 s of split 0's ~0.8 s run, and SHOW WATERMARKS showed paused_ms 0;
-- at 25 ms split 0 is paused for about 3 s of the run and the other splits
-- never. SET 'pipeline.watermark-alignment.buffer-size' = '0' decides on the
-- latest watermark (before 2.3's behaviour). Remove the ALIGNMENT GROUP
-- clause to see the difference, or run `weir bench alignment` for both
-- side by side.
--
--   weir run examples/backfill_alignment.sql

SET 'pipeline.name' = 'backfill';
SET 'parallelism.default' = '12';
SET 'table.dml-sync' = 'true';
SET 'pipeline.watermark-alignment.state-budget' = '256 mb';

CREATE TABLE bid (
  auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
    ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '30' SECOND UPDATE INTERVAL '25' MILLISECOND
) WITH (
  'connector' = 'nexmark',
  'nexmark.events' = '2000000',
  'splits' = '12',
  'nexmark.split-skew' = '6',
  -- Paced: the eleven slow splits read ~33 000 events/s each, split 0 six
  -- times that (uneven partitions rather than one burst).
  'nexmark.events-per-second' = '400000'
);

CREATE TABLE hot (auction BIGINT, bids BIGINT, window_end TIMESTAMP(3)) WITH ('connector' = 'blackhole');

INSERT INTO hot
SELECT auction, COUNT(*), window_end
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;

-- Per split: final watermark, time paused by alignment; per group; and the
-- drift that the 256 MB state budget would allow.
SHOW WATERMARKS FOR JOB 'backfill';
