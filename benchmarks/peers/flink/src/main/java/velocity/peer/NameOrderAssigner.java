package velocity.peer;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.Optional;
import java.util.TreeSet;
import org.apache.flink.connector.file.src.FileSourceSplit;
import org.apache.flink.connector.file.src.assigners.FileSplitAssigner;

/**
 * Hands out the files' splits in path order (then offset): with one reader, which asks
 * for its next split when one is done, the lines arrive in SPEC §1's arrival order, files
 * in lexicographic name order. (Flink's own assigners do not promise an order.)
 */
public class NameOrderAssigner implements FileSplitAssigner {
    private static final Comparator<FileSourceSplit> ORDER =
            Comparator.comparing((FileSourceSplit s) -> s.path().toString())
                    .thenComparingLong(FileSourceSplit::offset);

    private final TreeSet<FileSourceSplit> splits = new TreeSet<>(ORDER);

    public NameOrderAssigner(Collection<FileSourceSplit> initial) {
        splits.addAll(initial);
    }

    @Override
    public Optional<FileSourceSplit> getNext(String hostname) {
        return Optional.ofNullable(splits.pollFirst());
    }

    @Override
    public void addSplits(Collection<FileSourceSplit> more) {
        splits.addAll(more);
    }

    @Override
    public Collection<FileSourceSplit> remainingSplits() {
        return new ArrayList<>(splits);
    }
}
