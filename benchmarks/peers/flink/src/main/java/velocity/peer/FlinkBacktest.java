package velocity.peer;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * The Flink peer of {@code velocity backtest}: the complete-data alerts (SPEC §3) of a
 * Velocity rules file over a folder of JSON-lines events, as a bounded DataStream job in a
 * local MiniCluster.
 *
 * <pre>
 * FileSource (files in name order) -> parse + admit (p=1, arrival order) -> fan-out per
 * signature -> keyBy(signature, key) -> WindowEvaluator (p=2, keyed state) -> alert files
 * </pre>
 *
 * <p>Usage: {@code java -jar velocity-flink-peer.jar --rules FILE --events DIR --out DIR
 * [--mode batch|streaming] [--parallelism 2] [--bucket-seconds 60]
 * [--max-future-seconds 86400] [--managed-memory 1g]}
 *
 * <p>{@code batch} (the default) is what Flink advises for bounded input: the keyed input
 * is sorted by key and timestamp (eventTime) with managed memory before the keyed
 * operator, one key's state at a time, and each key's timers fire when its input ends.
 * {@code streaming} keeps every key's state in the HashMap state backend and holds each
 * key's events until the end-of-input watermark fires their timers in eventTime order.
 */
public final class FlinkBacktest {
    private FlinkBacktest() {}

    public static void main(String[] args) throws Exception {
        String rules = null, events = null, out = null, mode = "batch", memory = "1g";
        int parallelism = 2;
        long bucketSeconds = 60, maxFutureSeconds = 86_400;
        for (int i = 0; i < args.length; i += 2) {
            String value = i + 1 < args.length ? args[i + 1] : usage("missing value for " + args[i]);
            switch (args[i]) {
                case "--rules": rules = value; break;
                case "--events": events = value; break;
                case "--out": out = value; break;
                case "--mode": mode = value.toLowerCase(Locale.ROOT); break;
                case "--parallelism": parallelism = Integer.parseInt(value); break;
                case "--bucket-seconds": bucketSeconds = Long.parseLong(value); break;
                case "--max-future-seconds": maxFutureSeconds = Long.parseLong(value); break;
                case "--managed-memory": memory = value; break;
                default: usage("unknown option " + args[i]);
            }
        }
        if (rules == null || events == null || out == null) {
            usage("--rules, --events and --out are required");
        }
        if (!mode.equals("batch") && !mode.equals("streaming")) {
            usage("--mode must be batch or streaming, got " + mode);
        }
        List<Rules.Signature> signatures = Rules.read(Paths.get(rules));
        Path outDir = Paths.get(out);
        Files.createDirectories(outDir);
        try (var old = Files.newDirectoryStream(outDir, "alerts-*.jsonl")) {
            for (Path p : old) {
                Files.delete(p);
            }
        }

        Configuration conf = new Configuration();
        conf.set(ExecutionOptions.RUNTIME_MODE,
                mode.equals("batch") ? RuntimeExecutionMode.BATCH : RuntimeExecutionMode.STREAMING);
        conf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
        conf.set(PipelineOptions.OBJECT_REUSE, true);
        // The sort of BATCH mode runs in managed memory (the local default is 128 MB).
        conf.set(TaskManagerOptions.MANAGED_MEMORY_SIZE, MemorySize.parse(memory));
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(conf);
        // Set on each operator as well: in BATCH mode the adaptive batch scheduler would
        // otherwise choose the parallelism of the keyed stage from the data volume.
        env.setParallelism(parallelism);

        FileSource<String> source = FileSource
                .forRecordStreamFormat(new TextLineInputFormat(), new org.apache.flink.core.fs.Path(
                        Paths.get(events).toAbsolutePath().toUri()))
                .setSplitAssigner(NameOrderAssigner::new)
                .build();
        DataStream<KeyedEvent> keyed = env
                .fromSource(source, WatermarkStrategy.noWatermarks(), "events")
                .setParallelism(1)
                .flatMap(new Admission(maxFutureSeconds * 1000L)).name("parse+admit")
                .setParallelism(1)
                .flatMap(new FanOut(signatures)).name("fan-out")
                .setParallelism(1)
                .assignTimestampsAndWatermarks(WatermarkStrategy.<KeyedEvent>noWatermarks()
                        .withTimestampAssigner((e, previous) -> e.eventTime))
                .setParallelism(1);
        keyed.keyBy(e -> e.key)
                .process(new WindowEvaluator(signatures, bucketSeconds * 1000L))
                .name("decide")
                .setParallelism(parallelism)
                .sinkTo(new AlertFileSink(outDir.toString()))
                .name("alerts")
                .setParallelism(parallelism);

        long started = System.nanoTime();
        JobExecutionResult result = env.execute("velocity-flink-peer");
        System.out.printf("peer: mode %s, parallelism %d, %d signatures, job %.1f s (net runtime %.1f s)%n",
                mode, parallelism, signatures.size(), (System.nanoTime() - started) / 1e9,
                result.getNetRuntime() / 1000.0);
    }

    private static String usage(String problem) {
        System.err.println("velocity-flink-peer: " + problem);
        System.err.println("usage: --rules FILE --events DIR --out DIR [--mode batch|streaming] "
                + "[--parallelism N] [--bucket-seconds N] [--max-future-seconds N] "
                + "[--managed-memory SIZE]");
        System.exit(2);
        return null;
    }
}
