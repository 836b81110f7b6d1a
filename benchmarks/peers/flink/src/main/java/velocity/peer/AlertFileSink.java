package velocity.peer;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;

/**
 * Alerts as JSON lines, one file per subtask ({@code alerts-<subtask>.jsonl}) under a local
 * folder. A bounded benchmark's sink: no checkpoints, no commit protocol (Flink's FileSink
 * commits part files on checkpoints, which this job does not take in STREAMING mode).
 */
public class AlertFileSink implements Sink<String> {
    private final String folder;

    public AlertFileSink(String folder) {
        this.folder = folder;
    }

    @Override
    public SinkWriter<String> createWriter(WriterInitContext context) throws IOException {
        int subtask = context.getTaskInfo().getIndexOfThisSubtask();
        Path file = Paths.get(folder, "alerts-" + subtask + ".jsonl");
        BufferedWriter writer =
                Files.newBufferedWriter(file, StandardCharsets.UTF_8, java.nio.file.StandardOpenOption.CREATE,
                        java.nio.file.StandardOpenOption.TRUNCATE_EXISTING,
                        java.nio.file.StandardOpenOption.WRITE);
        return new SinkWriter<>() {
            @Override
            public void write(String line, Context ctx) throws IOException {
                writer.write(line);
                writer.write('\n');
            }

            @Override
            public void flush(boolean endOfInput) throws IOException {
                writer.flush();
            }

            @Override
            public void close() throws IOException {
                writer.close();
            }
        };
    }
}
