-- q1 shape: the price in euros.
CREATE TABLE bid (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price DECIMAL(23, 3), `dateTime` TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, 0.908 * price AS price, `dateTime` FROM bid;
