-- The narrow variant of passthrough.sql: three numeric columns, no strings
-- (the shape of earlier figures; it flatters the CSV reader).
CREATE TABLE bid (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS_NARROW}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price, `dateTime` FROM bid;
